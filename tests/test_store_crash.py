"""kill -9 at random moments: no committed station lost, none duplicated, none invented.

A child process (``storetest_support.py add``) stores stations of one run in plan order and
prints ``done i`` only after ``add_station`` returned. The parent SIGKILLs it at a random
moment (a random number of stations into the loop, or anywhere in its start-up), reopens
the store and checks it against the child's output, then starts the next child where the
parent *thinks* the run stands, one station early, as a daemon that cannot know whether its
last in-flight station got committed would: that station must come back as
DuplicateStation, never as a second row. Finally a child completes the run unkilled.
"""

from __future__ import annotations

import random
import selectors
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from storetest_support import make_station, same_station

from cellcal.daemon.store import DB_FILENAME, SCHEMA_VERSION, Store

# The slow tier (make test, not make check): this file runs simulated devices or processes in real time.
pytestmark = pytest.mark.slow

HELPER = str(Path(__file__).with_name("storetest_support.py"))
KILLS = 24
PLAN_LEN = 1000
SEED = 20261130


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, HELPER, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _read_until(proc: subprocess.Popen, wanted: set[str], timeout_s: float) -> str:
    """Read stdout lines until one is in ``wanted``; return every line read (the parent
    parses them with the rest of the output after the kill)."""
    deadline = time.monotonic() + timeout_s
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    lines: list[str] = []
    try:
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"child did not print any of {sorted(wanted)} within {timeout_s} s"
            if sel.select(timeout=left):
                line = proc.stdout.readline()
                assert line, f"child exited before any of {sorted(wanted)}: {proc.stderr.read()}"
                lines.append(line)
                if line.strip() in wanted:
                    return "".join(lines)
    finally:
        sel.unregister(proc.stdout)


def _parse(out: str) -> dict[str, list[int]]:
    events: dict[str, list[int]] = {"begin": [], "done": [], "dup": []}
    for line in out.splitlines():
        word, _, arg = line.partition(" ")
        if word in events:
            events[word].append(int(arg))
    return events


def _check_db(db: Path, run: int) -> list[int]:
    """Integrity and uniqueness straight from SQLite, independent of the Store class."""
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        dupes = conn.execute(
            "SELECT plan_index, count(*) FROM stations WHERE run_id = ? GROUP BY plan_index HAVING count(*) > 1",
            (run,),
        ).fetchall()
        assert dupes == [], f"duplicated stations: {dupes}"
        return [r[0] for r in conn.execute("SELECT plan_index FROM stations WHERE run_id = ? ORDER BY plan_index", (run,))]
    finally:
        conn.close()


@pytest.mark.timeout(600)  # 25 child processes: minutes on a loaded machine
def test_kill_9_during_capture_loses_and_duplicates_nothing_then_resumes(tmp_path):
    rng = random.Random(SEED)
    state = tmp_path / "state"
    with Store(state) as store:
        run = store.create_run("base_frame", {"stations": PLAN_LEN}, config_sha256="0" * 64, devices={})
    committed: list[int] = []  # what the store held after the previous kill
    confirmed_next = 0  # one past the last station a child confirmed with "done"
    dup_seen = 0
    mid_loop_kills = in_flight_kills = 0
    for k in range(KILLS):
        # Resume one early: the daemon cannot know whether its last station was committed.
        start = max(0, confirmed_next - 1)
        proc = _spawn("add", str(state), str(run), str(start), str(PLAN_LEN))
        seen = ""
        if k % 6 == 5:
            time.sleep(rng.uniform(0.0, 0.4))  # anywhere, including during start-up and open()
        else:
            # Inside the capture loop, a random number of stations in (so past the one re-added
            # at `start` in most kills), then a random moment within the next: counted in
            # stations, not seconds, since a busy disk can take longer than any fixed delay
            # to commit even one.
            last = min(start + rng.randint(0, 8), PLAN_LEN - 1)
            seen = _read_until(proc, {f"begin {last}", "finished"}, 60)
            time.sleep(rng.uniform(0.0, 0.025))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # Not communicate(): it reads the raw pipe and would miss lines the text wrapper
        # already buffered while we read the first ones. The child is dead: read() ends.
        out, err = seen + proc.stdout.read(), proc.stderr.read()
        proc.stdout.close()
        proc.stderr.close()
        assert proc.returncode in (-signal.SIGKILL, 0), err
        ev = _parse(out)
        mid_loop_kills += bool(ev["begin"]) and proc.returncode == -signal.SIGKILL
        # Killed between "begin i" and its outcome: inside add_station, most likely in the
        # transaction or its fsync.
        in_flight_kills += bool(ev["begin"]) and ev["begin"][-1] not in ev["done"] + ev["dup"]

        now = _check_db(state / DB_FILENAME, run)
        assert set(ev["done"]) <= set(now), f"kill {k}: confirmed stations lost"
        assert set(committed) <= set(now), f"kill {k}: stations committed earlier are gone"
        assert set(now) <= set(committed) | set(ev["begin"]), f"kill {k}: a station nobody started"
        assert now == list(range(len(now))), f"kill {k}: gap in {now}"
        # The station re-added at `start` was committed before, so it must come back as a
        # duplicate (if the child got that far), never as a new row.
        for i in ev["dup"]:
            assert i in committed, f"kill {k}: DuplicateStation for {i}, which was not committed"
        if start in committed and start + 1 in ev["begin"]:  # the child got past it
            assert start in ev["dup"]
            dup_seen += 1
        committed = now
        if ev["done"]:
            confirmed_next = max(ev["done"]) + 1

    print(f"{mid_loop_kills} kills in the loop, {in_flight_kills} inside add_station, "
          f"{len(committed)} stations committed before the final resume")
    assert mid_loop_kills >= KILLS // 2, "most kills should land inside the capture loop"
    assert in_flight_kills >= KILLS // 4, "kills should land inside add_station"
    # On a fast disk a child killed late in its start-up window can finish the whole plan;
    # the resume below must then find every station committed and add nothing.
    assert dup_seen >= 1 and 0 < len(committed) <= PLAN_LEN

    # Resume to the end without a kill.
    proc = _spawn("add", str(state), str(run), str(max(0, confirmed_next - 1)), str(PLAN_LEN))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.rstrip().endswith("finished")
    assert _check_db(state / DB_FILENAME, run) == list(range(PLAN_LEN))
    with Store(state) as store:
        got = store.stations(run)
        assert store.get_run(run).status == "capturing"  # ready to be solved, as after a resume
    assert [s.plan_index for s in got] == list(range(PLAN_LEN))
    assert all(same_station(s, make_station(s.plan_index)) for s in got)  # every bit as written


def test_kill_9_while_creating_a_fresh_database(tmp_path):
    """A child creates and migrates a new store and is killed at a random moment: the file
    afterwards is either absent, or opens (migrating if needed) and passes integrity_check."""
    rng = random.Random(SEED + 1)
    for k in range(4):
        state = tmp_path / f"fresh{k}"
        proc = _spawn("open", str(state))
        time.sleep(rng.uniform(0.05, 0.3))
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=30)
        with Store(state) as store:
            assert store.settings()["integrity_check"] == "ok"
            assert store.settings()["schema_version"] == SCHEMA_VERSION
            assert len(store.list_runs()) <= 1
            store.create_run("base_frame", {}, config_sha256="0" * 64, devices={})
