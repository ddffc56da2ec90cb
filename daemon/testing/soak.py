"""The kill -9 soak: ``cellcal run`` killed at random moments of its capture, restarted, and
its store audited (no accepted station lost or duplicated, one result per run).

``bench/kill_soak.py`` is its command line; ``tests/test_daemon_kill.py`` runs a short one.
The reference run (:func:`reference_run`, the same cell never killed) gives the result a
soaked run must agree with (``harness.deviation_sigmas``).
"""

from __future__ import annotations

import dataclasses
import math
import random
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from cellcal.daemon import protocol as P
from cellcal.daemon.store import RunStatus
from cellcal.daemon.wire.client import Client
from cellcal.testing.harness import (
    _OPEN,
    FAST_SCENARIO,
    K_SIGMA,
    SCENARIOS,
    DaemonProcess,
    Recorder,
    SimProcess,
    SoakError,
    audit_store,
    daemon_config,
    deviation_sigmas,
    profile_of,
    run_status,
    transform_and_cov,
    write_config,
)

__all__ = ["Instance", "SoakReport", "soak", "reference_run", "check_audit"]




@dataclasses.dataclass
class Instance:
    """One daemon process of the soak."""

    boot_id: str | None
    started_s: float
    killed_s: float | None = None
    accepted: list[tuple[int, int]] = dataclasses.field(default_factory=list)  # (run_id, index)
    state_at_kill: str | None = None
    committed: int = 0  # stations the store gained while this instance ran


@dataclasses.dataclass
class SoakReport:
    kills: int
    instances: list[Instance]
    published_accepted: set[tuple[int, int]]
    audit: dict
    reference: dict
    runs_done: list[int]
    worst_sigma: float
    worst_translation_m: float
    worst_rotation_rad: float
    wall_s: float
    kills_by_accepted_before: dict[int, int]
    rejections_seen: int
    runs_resumed: int = 0

    def summary(self) -> str:
        stations = len(self.audit["stations"])
        return (
            f"{self.kills} kill -9 over {len(self.instances)} daemon starts in {self.wall_s:.1f} s; "
            f"{stations} stations committed in {len(self.runs_done)} finished runs, "
            f"{len(self.published_accepted)} seen published as accepted, all present once; "
            f"worst result deviation from the uninterrupted run {self.worst_translation_m * 1e6:.2f} um, "
            f"{math.degrees(self.worst_rotation_rad) * 1e3:.3f} mdeg ({self.worst_sigma:.2f} sigma, limit {K_SIGMA:g})"
        )


def _wait_heartbeat(rec: Recorder, daemon: DaemonProcess, known_boots: set[str], timeout_s: float) -> tuple[str, str]:
    """``(boot_id, state)`` from the first heartbeat of a new daemon instance.

    The instance's first messages (a resumed run's CAPTURING) may go out before this SUB
    socket has reconnected (ZeroMQ's slow joiner); the heartbeat repeats the state.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for topic, env in rec.pump(0.05):
            if topic == P.TOPIC_HEARTBEAT and env["boot_id"] not in known_boots:
                return env["boot_id"], str(env["body"]["state"])
        if not daemon.alive():
            raise SoakError(f"cellcal run exited with {daemon.returncode}:\n{daemon.log_tail()}")
    raise SoakError(f"no heartbeat from the new daemon within {timeout_s} s:\n{daemon.log_tail()}")


def _start_run(cmd_endpoint: str) -> int:
    with Client(cmd_endpoint, timeout_s=3.0, retries=2) as c:
        return int(c.call("start_run", kind="base_frame")["run_id"])


def reference_run(sim_urls: Mapping[str, str], workdir: Path, *, n_stations: int, timeout_s: float = 60.0,
                  profile: str = "exact") -> dict:
    """One uninterrupted run through ``cellcal run`` (stopped with SIGTERM after its result)."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = daemon_config(robot_url=sim_urls["robot"], tracker_url=sim_urls["tracker"], workdir=workdir, n_stations=n_stations,
                        profile=profile)
    conf = write_config(workdir / "cellcal.toml", cfg)
    rec = Recorder(cfg["zmq"]["pub_endpoint"])
    daemon = DaemonProcess(conf, workdir / "daemon.log")
    try:
        daemon.start()
        _wait_heartbeat(rec, daemon, set(), 20.0)
        run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
        _t, env = rec.wait_for(lambda t, b: t == P.TOPIC_RESULT and b.get("run_id") == str(run_id),
                               timeout_s, alive=daemon.alive, what=f"the result of reference run {run_id}")
        rc = daemon.terminate()
        if rc != 0:
            raise SoakError(f"reference daemon exited {rc} after SIGTERM:\n{daemon.log_tail()}")
        return env["body"]
    finally:
        daemon.stop()
        rec.close()


def soak(
    kills: int,
    *,
    workdir: Path,
    seed: int = 0,
    n_stations: int = 8,
    scenario: Path | str | None = None,
    log: Callable[[str], None] = lambda _m: None,
    per_step_timeout_s: float = 30.0,
    profile: str | None = None,
) -> SoakReport:
    """Kill ``cellcal run`` with SIGKILL ``kills`` times while it captures; audit; return the report.

    Raises SoakError when a promise is broken (a published station missing, a duplicate, a
    run that does not finish, a result that disagrees with the uninterrupted run).
    """
    t0 = time.monotonic()
    rng = random.Random(seed)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    profile = (profile_of(scenario) if scenario is not None else "exact") if profile is None else profile
    sim = SimProcess(SCENARIOS.get(scenario, FAST_SCENARIO) if isinstance(scenario, str)
                     else scenario if scenario is not None else FAST_SCENARIO, workdir / "sim.log")
    daemon: DaemonProcess | None = None
    rec: Recorder | None = None
    try:
        urls = sim.start()
        log(f"sim: {urls}")
        reference = reference_run(urls, workdir / "reference", n_stations=n_stations, profile=profile)
        log(f"reference run: {reference['n_stations']} stations, rms {reference['rms_translation_m'] * 1e6:.2f} um")

        kdir = workdir / "killed"
        kdir.mkdir()
        cfg = daemon_config(robot_url=urls["robot"], tracker_url=urls["tracker"], workdir=kdir, n_stations=n_stations,
                            profile=profile)
        conf = write_config(kdir / "cellcal.toml", cfg)
        state_dir = Path(cfg["service"]["state_dir"])
        rec = Recorder(cfg["zmq"]["pub_endpoint"])
        instances: list[Instance] = []
        boots: set[str] = set()
        published: set[tuple[int, int]] = set()
        by_accepted: dict[int, int] = {}
        rejections = 0
        run_id: int | None = None
        n_kills = 0
        n_committed = 0
        interrupted: set[int] = set()  # runs open when an instance was killed
        while n_kills < kills:
            # Every message of the new instance counts, also those that came in before its
            # first heartbeat reached us (the first one can fall in ZeroMQ's join window).
            cursor = len(rec.messages)
            daemon = DaemonProcess(conf, kdir / "daemon.log").start()
            inst = Instance(None, time.monotonic() - t0)
            instances.append(inst)
            inst.boot_id, first_state = _wait_heartbeat(rec, daemon, boots, per_step_timeout_s)
            state: str | None = first_state
            boots.add(inst.boot_id)
            if run_id is None or run_status(state_dir, run_id) not in _OPEN:
                # The previous run finished (maybe just before the last kill): start the next.
                run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
                log(f"run {run_id} started")
            # Kill after a random number of this instance's accepted stations, then a random
            # delay up to about one station's time: the kill lands in any phase of a station.
            want = rng.choice((0, 0, 1, 1, 2))
            delay = rng.uniform(0.0, 0.6)
            deadline = time.monotonic() + per_step_timeout_s
            kill_at = None
            next_poll = time.monotonic() + 0.2
            while True:
                rec.pump(0.02)
                new, cursor = rec.messages[cursor:], len(rec.messages)
                for topic, env in new:
                    if env["boot_id"] != inst.boot_id:
                        continue
                    b = env["body"]
                    if topic == P.TOPIC_STATION:
                        if b["accepted"]:
                            key = (int(str(b["run_id"])), int(str(b["index"])))
                            if key in published:
                                raise SoakError(f"station {key} published as accepted twice")
                            published.add(key)
                            inst.accepted.append(key)
                        else:
                            rejections += 1
                    elif topic in (P.TOPIC_STATE, P.TOPIC_HEARTBEAT):
                        state = str(b["state"])
                    elif topic == P.TOPIC_RESULT and b.get("run_id") == str(run_id) and not b.get("retained"):
                        # The run finished before this instance's kill: start another one
                        # and kill this instance during *its* capture instead.
                        log(f"run {run_id} done ({b.get('n_stations')} stations)")
                        run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
                        log(f"run {run_id} started")
                        kill_at = None
                    elif topic == P.TOPIC_FAULT:
                        log(f"fault: {b.get('message')}")
                if (kill_at is None and state == P.STATE_IDLE and time.monotonic() >= next_poll
                        and run_status(state_dir, run_id) not in _OPEN):
                    # The run closed without us seeing its result (a resumed run that only had
                    # to be closed, its message sent before our SUB caught up): start the next.
                    log(f"run {run_id} closed")
                    run_id = _start_run(cfg["zmq"]["cmd_endpoint"])
                    log(f"run {run_id} started")
                    state = None
                if state == P.STATE_IDLE and time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + 0.2
                if kill_at is None and len(inst.accepted) >= want and state == P.STATE_CAPTURING:
                    kill_at = time.monotonic() + delay
                if kill_at is not None and time.monotonic() >= kill_at:
                    break
                if not daemon.alive():
                    raise SoakError(f"cellcal run exited by itself ({daemon.returncode}):\n{daemon.log_tail()}")
                if time.monotonic() > deadline:
                    raise SoakError(f"instance {len(instances)} did not capture within {per_step_timeout_s} s:\n"
                                    f"{daemon.log_tail()}")
            inst.state_at_kill = state
            interrupted.add(run_id)
            rc = daemon.kill9()
            if rc != -signal.SIGKILL:
                raise SoakError(f"kill -9 gave exit code {rc}")
            inst.killed_s = time.monotonic() - t0
            n_kills += 1
            by_accepted[len(inst.accepted)] = by_accepted.get(len(inst.accepted), 0) + 1
            # Everything this instance published must be in the store already.
            now_stored = set(map(tuple, audit_store(state_dir)["stations"]))
            inst.committed, n_committed = len(now_stored) - n_committed, len(now_stored)
            missing = set(inst.accepted) - now_stored
            if missing:
                raise SoakError(f"stations published as accepted but not in the store after kill {n_kills}: {sorted(missing)}")
            if n_kills % 10 == 0:
                log(f"{n_kills} kills, {len(published)} stations published so far")

        # A last instance finishes the open run; SIGTERM stops it cleanly.
        cursor = len(rec.messages)
        daemon = DaemonProcess(conf, kdir / "daemon.log").start()
        inst = Instance(None, time.monotonic() - t0)
        instances.append(inst)
        inst.boot_id, _state = _wait_heartbeat(rec, daemon, boots, per_step_timeout_s)
        assert run_id is not None  # every kill happened during a run
        if run_status(state_dir, run_id) in _OPEN:
            deadline = time.monotonic() + per_step_timeout_s * 2
            while run_status(state_dir, run_id) in _OPEN:
                rec.pump(0.05)
                new, cursor = rec.messages[cursor:], len(rec.messages)
                for topic, env in new:
                    if topic == P.TOPIC_STATION and env["boot_id"] == inst.boot_id and env["body"]["accepted"]:
                        published.add((int(str(env["body"]["run_id"])), int(str(env["body"]["index"]))))
                if not daemon.alive():
                    raise SoakError(f"the last daemon exited:\n{daemon.log_tail()}")
                if time.monotonic() > deadline:
                    raise SoakError(f"run {run_id} did not finish after the last restart:\n{daemon.log_tail()}")
        rec.pump(0.1)
        rc = daemon.terminate()
        if rc != 0:
            raise SoakError(f"the last daemon exited {rc} after SIGTERM:\n{daemon.log_tail()}")
        daemon = None

        audit = audit_store(state_dir)
        check_audit(audit, published, n_stations)
        T_ref, C_ref = transform_and_cov(reference)
        worst = (0.0, 0.0, 0.0)
        runs_done = sorted(r for r, v in audit["runs"].items() if v["status"] == RunStatus.DONE)
        for res in audit["results"]:
            T, C = transform_and_cov(res["result"])
            xi, sig = deviation_sigmas(T_ref, C_ref, T, C)
            if float(sig.max()) > K_SIGMA:
                raise SoakError(
                    f"result {res['id']} (run {res['run_id']}) differs from the uninterrupted run by "
                    f"{np.array2string(xi, precision=9)} = {np.array2string(sig, precision=2)} sigma (limit {K_SIGMA})"
                )
            worst = (max(worst[0], float(sig.max())), max(worst[1], float(np.linalg.norm(xi[:3]))),
                     max(worst[2], float(np.linalg.norm(xi[3:]))))
        return SoakReport(
            kills=n_kills, instances=instances, published_accepted=published, audit=audit, reference=reference,
            runs_done=runs_done, worst_sigma=worst[0], worst_translation_m=worst[1], worst_rotation_rad=worst[2],
            wall_s=time.monotonic() - t0, kills_by_accepted_before=by_accepted, rejections_seen=rejections,
            runs_resumed=len(interrupted & set(runs_done)),
        )
    finally:
        if daemon is not None:
            daemon.stop()
        if rec is not None:
            rec.close()
        sim.stop()


def check_audit(audit: dict, published: set[tuple[int, int]], n_stations: int) -> None:
    if audit["integrity"] != ["ok"]:
        raise SoakError(f"PRAGMA integrity_check: {audit['integrity']}")
    if audit["duplicates"]:
        raise SoakError(f"stations stored twice: {audit['duplicates']}")
    stored = set(map(tuple, audit["stations"]))
    if missing := published - stored:
        raise SoakError(f"stations published as accepted but missing from the store: {sorted(missing)}")
    for run_id, r in audit["runs"].items():
        if r["status"] != RunStatus.DONE:
            raise SoakError(f"run {run_id} ended {r['status']} ({r['reason']})")
        got = sorted(i for (rid, i) in stored if rid == run_id)
        if got != list(range(n_stations)):
            raise SoakError(f"run {run_id} has stations {got}, expected 0..{n_stations - 1} once each")
    per_run: dict[int, int] = {}
    for res in audit["results"]:
        per_run[res["run_id"]] = per_run.get(res["run_id"], 0) + 1
    if per_run != {r: 1 for r in audit["runs"]}:
        raise SoakError(f"results per run {per_run}: every run must have exactly one")
