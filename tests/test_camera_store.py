"""Camera stations in the store (ADR 0030): the image beside the database before the row.

* the image goes to ``<state_dir>/images/run_<id>/station_<index>.png`` and the row holds its
  path, sha256 and size (the store decides them); a duplicate never replaces a committed
  station's image;
* migration 2 is the column ``station_column_ddl`` writes for ``StationRecord.camera``, and a
  store of schema 1 migrates with its stations intact;
* ``kill -9`` at random moments of a child adding camera stations: afterwards every row's
  image is there, whole (its sha256 and size are the row's), and nothing a child reported
  committed is missing.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _camera_store_child import camera_station
from storetest_support import make_station, same_station

from cellcal.daemon.store import (
    DB_FILENAME,
    MIGRATIONS,
    DuplicateStation,
    StationRecord,
    Store,
    station_column_ddl,
    station_image_path,
)

HERE = Path(__file__).resolve().parent


def _run(store: Store) -> int:
    return store.create_run("intrinsics", {"stations": []}, config_sha256="0" * 64, devices={})


def _audit(state: Path, run: int) -> list[int]:
    """Every row of ``run`` has its whole image (raises AssertionError naming the station);
    returns the committed plan indices."""
    with Store(state, read_only=True) as store:
        stations = store.stations(run)
    for s in stations:
        assert s.image_png is None
        if s.camera is None:
            continue  # a station without a camera has no image
        cam = s.camera
        assert cam.get("image") == station_image_path(run, s.plan_index), cam
        data = (state / str(cam["image"])).read_bytes()  # never a row without its image
        assert len(data) == cam["image_bytes"] and hashlib.sha256(data).hexdigest() == cam["image_sha256"], s.plan_index
    return [s.plan_index for s in stations]


def test_a_camera_station_s_image_is_written_beside_the_store_with_its_hash_in_the_row(tmp_path):
    state = tmp_path / "state"
    with Store(state) as store:
        run = _run(store)
        st = camera_station(0)
        assert st.image_png is not None
        store.add_station(run, st)
        store.add_station(run, make_station(1))  # a station without a camera: no image, camera None
        a, b = store.stations(run)
    assert _audit(state, run) == [0, 1]
    path = state / "images" / f"run_{run}" / "station_0.png"
    assert path.read_bytes() == st.image_png
    assert a.camera is not None and a.camera["image_sha256"] == hashlib.sha256(st.image_png).hexdigest()
    assert st.camera is not None and a.camera["detection"] == st.camera["detection"] and a.image_png is None
    assert b.camera is None and same_station(b, make_station(1))
    assert [p.name for p in path.parent.iterdir()] == ["station_0.png"]  # no temporary left


def test_a_duplicate_never_replaces_the_committed_image(tmp_path):
    state = tmp_path / "state"
    with Store(state) as store:
        run = _run(store)
        store.add_station(run, camera_station(0))
        before = (state / station_image_path(run, 0)).read_bytes()
        other = camera_station(1)
        again = StationRecord(**{**{k: getattr(other, k) for k in StationRecord.__dataclass_fields__}, "plan_index": 0})
        with pytest.raises(DuplicateStation):
            store.add_station(run, again)
    assert (state / station_image_path(run, 0)).read_bytes() == before
    assert sorted(p.name for p in (state / station_image_path(run, 0)).parent.iterdir()) == ["station_0.png"]
    assert _audit(state, run) == [0]


def test_migration_2_is_the_camera_column_and_a_schema_1_store_migrates(tmp_path):
    assert MIGRATIONS[2][1] == (station_column_ddl(StationRecord, "camera"),)
    state = tmp_path / "state"
    with Store(state) as old:
        run = _run(old)
        old.add_station(run, make_station(0))
    conn = sqlite3.connect(state / DB_FILENAME, isolation_level=None)  # back to what the previous release made
    conn.execute("ALTER TABLE stations DROP COLUMN camera_json")
    conn.execute("DELETE FROM schema_version WHERE version = 2")
    conn.close()
    with Store(state) as store:
        assert store.settings()["schema_version"] == 2
        (st,) = store.stations(run)
        assert st.camera is None and same_station(st, make_station(0))
        store.add_station(run, camera_station(1))
    assert _audit(state, run) == [0, 1]
    conn = sqlite3.connect(state / DB_FILENAME)
    assert "camera_json" in [r[1] for r in conn.execute("PRAGMA table_info(stations)")]
    conn.close()


@pytest.mark.slow  # kills child processes in real time
def test_kill_9_never_leaves_a_row_without_its_whole_image(tmp_path):
    state = tmp_path / "state"
    with Store(state) as store:
        run = _run(store)
    rng = random.Random(20261202)
    reported: set[int] = set()
    next_index, kills = 0, 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    while kills < 20:
        proc = subprocess.Popen([sys.executable, str(HERE / "_camera_store_child.py"), str(state), str(run),
                                 str(next_index), "1000"], stdout=subprocess.PIPE, text=True, env=env)
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.25))  # a random moment: writing an image, renaming it, committing
        proc.send_signal(signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        kills += 1
        for line in out.splitlines():
            word, _, i = line.partition(" ")
            if word in ("done", "dup"):
                reported.add(int(i))
        committed = _audit(state, run)  # raises on a row without its whole image
        assert reported <= set(committed)  # what a child saw committed is there
        next_index = max(committed, default=-1) + 1
    assert len(committed) >= 10, committed  # the kills landed while stations were being added
    folder = state / "images" / f"run_{run}"
    images = {p.name for p in folder.iterdir() if not p.name.startswith(".")}
    # an image may exist without its row (killed between the rename and the commit): never the reverse
    assert {f"station_{i}.png" for i in committed} <= images
    temporaries = [p.name for p in folder.iterdir() if p.name.startswith(".")]
    assert len(temporaries) <= 1 + len(images) - len(committed), temporaries  # at most the station being written
