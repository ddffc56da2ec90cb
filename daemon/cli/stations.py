"""``cellcal stations RUN_ID -o FILE``: a run's stations as a file ``cellcal solve`` reads.

``FILE`` ending in ``.csv``: CSV in millimetres and quaternions ``w, x, y, z``; anything
else: JSON lines in metres (``cellcal.daemon.cli.stations_io``). The stations are the ones the
daemon solved: the run's stored stations in plan order (a base frame's ``cell_T_target``,
a tool point's flange poses), or the stations a client gave with the run (hand-eye:
``camera_T_target``).

The file also carries what the daemon solved them with: the ``[solve]`` settings of the run's
result (its provenance's ``solve_settings``, one ``# cellcal-settings:`` line naming the
result and its transforms), each station's measurement covariance as the daemon declared it
(``cellcal.daemon.solve.station_covariance``, from the stored tracker figures) and its capture
time and speed. ``cellcal solve FILE --kind KIND`` then repeats the daemon's solve and says
how far its answer is from the stored one (1e-9 m and below: the same solve). A run without
a stored result, or one stored before results carried their settings, is written with the
stations alone, and the file says so.

A base-frame run of 3-DoF point stations (``[tracker] measure = "point"``) is written as
point stations (``cell_p_target``), which ``cellcal solve`` solves by the point model. A
kinematics run is refused: its stations need the arm's joint angles and model, and its
identified parameters are exported with its result (``result_<id>_kinematics.json``).

A camera run (its stations have images: ``intrinsics``) is written as a dataset folder
(``FILE`` is the folder, ``cellcal.daemon.cli.dataset``): each station's stored PNG as it is
(same bytes, same sha256), ``stations.csv`` with the flange pose of each, and ``target.toml``,
the target file the run captured with (kept with its plan). ``cellcal solve DIR --setup
intrinsics`` solves it to the daemon's answer.

An existing ``FILE``, or a symbolic link there, is refused unless ``--force``
(``cellcal.daemon.cli.output``).

Exit codes: 0 written; 2 no such run / store / configuration, a run without stations, an
existing file without ``--force``, or the file cannot be written.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from cellcal.daemon import solve
from cellcal.daemon.bodies import transform_from_wire
from cellcal.daemon.cli.dataset import DatasetError, write_dataset
from cellcal.daemon.cli.output import OutputRefused, check_output, write_output
from cellcal.daemon.cli.results import CommandError, add_state_arguments, open_store, parse_id
from cellcal.daemon.cli.stations_io import MEASUREMENT_KEYS, format_stations
from cellcal.daemon.report.reading import as_list, as_map
from cellcal.daemon.runs.intrinsics import TARGET_KEY
from cellcal.daemon.store import ResultRecord, StationRecord, Store, StoreError, UnknownRecord


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_id", metavar="RUN_ID", help="the run whose stations to export")
    p.add_argument("-o", "--output", required=True, metavar="FILE",
                   help="the station file to write: .csv (mm, quaternion w,x,y,z) or .jsonl (SI, 4x4 lists); "
                        "for a camera run the dataset folder (images, stations.csv, target.toml)")
    p.add_argument("--force", action="store_true",
                   help="replace FILE if it exists (a symlink: the link, not its target)")
    add_state_arguments(p)


@dataclass
class SolvedWith:
    """What a run's result was solved with (:func:`solved_with`): the station file's extras."""

    settings: dict[str, object] | None = None
    covariances: npt.NDArray[np.float64] | None = None
    capture_time_s: npt.NDArray[np.float64] | None = None
    capture_speed_m_s: npt.NDArray[np.float64] | None = None
    note: str = ""


def _last_result(store: Store, run_id: int) -> ResultRecord | None:
    found = [r for r in store.list_results(limit=100_000) if r.run_id == run_id]
    return max(found, key=lambda r: r.id) if found else None


def solved_with(store: Store, run_id: int, stations: Sequence[StationRecord], *, point: bool,
                measured: bool = True) -> SolvedWith:
    """The settings, covariances and capture signature the daemon solved a run's stored
    stations with, from its latest result's provenance; an empty record (with a ``note``)
    when there is no result or it does not carry them."""
    res = _last_result(store, run_id)
    if res is None:
        return SolvedWith(note="the run has no stored result: cellcal solve uses its own defaults")
    raw = res.provenance.get("solve_settings")
    if not isinstance(raw, dict):
        return SolvedWith(note=f"result {res.id} does not record its solve settings: cellcal solve uses its own "
                               "defaults")
    try:
        cfg = solve.settings_solve(raw)
    except ValueError as exc:
        return SolvedWith(note=f"result {res.id}'s solve settings cannot be read ({exc})")
    body = res.result if isinstance(res.result, dict) else {}
    transforms = body.get("transforms") if isinstance(body, dict) else None
    named: dict[str, object] = {}
    if isinstance(transforms, dict):
        for name, t in transforms.items():
            try:
                named[str(name)] = transform_from_wire(as_map(t)).tolist()
            except (KeyError, TypeError, ValueError):
                continue
    settings: dict[str, object] = {"solve": dict(solve.solve_settings(cfg)), "noise": "estimated",
                                   "result": {"id": res.id, "run_id": run_id, "transforms": named}}
    if not measured or not stations:
        # A tool point (the flange poses alone) or stations given with the run: solved with
        # the options, the noise estimated from the residuals.
        return SolvedWith(settings)
    noise = solve.declared_noise(stations, cfg, point=point)
    covs = noise.get("cell_p_target_cov") if point else noise.get("cell_T_target_cov")
    if covs is not None:
        settings["noise"] = "declared per station"
    sig = solve.capture_signature(stations)
    return SolvedWith(settings, covs, sig["capture_time_s"], sig["capture_speed_m_s"])


def run_stations(store: Store, run_id: int) -> tuple[str, npt.NDArray[np.float64], npt.NDArray[np.float64] | None, str]:
    """``(kind, base_T_flange (N,4,4), measured, where)`` of a stored run: ``measured`` the
    (N,4,4) poses of the kind's measurement, the (N,3) ``cell_p_target`` of a point run
    (metres), or None (a tool point).

    Raises
    ------
    CommandError
        No such run, no stations, a kind ``cellcal solve`` does not solve, or stations
        that mix poses and points.
    """
    try:
        run = store.get_run(run_id)
    except UnknownRecord:
        raise CommandError(f"no run {run_id} in {store.state_dir}") from None
    kind = run.kind
    if kind not in MEASUREMENT_KEYS:
        extra = (" (the identified parameters are exported with its result: result_<id>_kinematics.json)"
                 if kind == "kinematics" else "")
        raise CommandError(f"run {run_id} is a {kind} run: cellcal solve reads base_frame, hand_eye and "
                           f"tool_point stations{extra}")
    key = MEASUREMENT_KEYS[kind]
    stations = store.stations(run_id)
    if stations:
        G = np.array([s.base_T_flange for s in stations])
        point = [s.cell_T_target is None and s.cell_p_target is not None for s in stations]
        if kind == "base_frame" and any(point):
            if not all(point):
                raise CommandError(f"run {run_id} mixes pose and point stations: no station file holds both")
            return kind, G, np.array([s.cell_p_target for s in stations], dtype=float), "stored point stations"
        if key is None:
            return kind, G, None, "stored stations"
        if key != "cell_T_target" or any(s.cell_T_target is None for s in stations):
            raise CommandError(f"run {run_id} ({kind}) has stations without {key}")
        return kind, G, np.array([s.cell_T_target for s in stations]), "stored stations"
    listed = as_map(run.plan, "plan").get("given")
    if not listed:
        raise CommandError(f"run {run_id} has no stations (status {run.status.value}: {run.status_reason or 'open'})")
    try:
        given = as_list(listed, "plan.given")
        G = np.array([np.asarray(as_map(s)["base_T_flange"], dtype=float).reshape(4, 4) for s in given])
        M = None if key is None else np.array([np.asarray(as_map(s)[key], dtype=float).reshape(4, 4) for s in given])
    except (KeyError, TypeError, ValueError) as exc:
        raise CommandError(f"run {run_id}: the given stations lack what a {kind} needs ({exc})") from None
    return kind, G, M, "stations given with the run"


def camera_rows(store: Store, run_id: int) -> tuple[str, str, list[tuple[str, bytes, npt.NDArray[np.float64] | None]]] | None:
    """``(kind, target file text, [(image name, PNG bytes, base_T_flange)])`` of a camera run
    (its stations have images), or None for any other run.

    Raises
    ------
    CommandError
        A station's image is missing or not the one its row names (its sha256), or the run
        kept no target file.
    """
    try:
        run = store.get_run(run_id)
    except UnknownRecord:
        raise CommandError(f"no run {run_id} in {store.state_dir}") from None
    stations = store.stations(run_id)
    if not stations or all(s.camera is None for s in stations):
        return None
    target = as_map(as_map(run.plan, "plan").get(TARGET_KEY), TARGET_KEY)
    toml = target.get("toml")
    if not isinstance(toml, str) or not toml:
        raise CommandError(f"run {run_id} kept no target file with its plan: its stations cannot be written as a dataset")
    rows: list[tuple[str, bytes, npt.NDArray[np.float64] | None]] = []
    for s in stations:
        cam = as_map(s.camera, "camera")
        rel = cam.get("image")
        if not isinstance(rel, str):
            raise CommandError(f"run {run_id} station {s.plan_index} has no image")
        path = store.state_dir / rel
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CommandError(f"run {run_id} station {s.plan_index}: cannot read its image {path}: {exc}") from None
        if hashlib.sha256(data).hexdigest() != cam.get("image_sha256"):
            raise CommandError(f"run {run_id} station {s.plan_index}: {path} is not the image its row names (sha256)")
        rows.append((f"station_{s.plan_index}.png", data, np.asarray(s.base_T_flange, dtype=float)))
    return run.kind, toml, rows


def run(args: argparse.Namespace) -> int:
    try:
        run_id = parse_id(args.run_id, "RUN_ID")
        store = open_store(args)
        try:
            camera = camera_rows(store, run_id)
            state_dir = store.state_dir
            if camera is None:
                check_output(args.output, force=args.force)  # before the work (and again when written)
                kind, G, M, where = run_stations(store, run_id)
                extras = solved_with(store, run_id, store.stations(run_id), point=M is not None and M.ndim == 2,
                                     measured=M is not None)
        finally:
            store.close()
    except (CommandError, OutputRefused) as exc:
        print(f"cellcal stations: {exc}", file=sys.stderr)
        return 2
    if camera is not None:
        return _write_camera(Path(args.output), run_id, state_dir, *camera)
    out = Path(args.output)
    again = f"solve again with: cellcal solve {out.name} --kind {kind}"
    if extras.settings is not None:
        result_id = as_map(extras.settings["result"]).get("id")
        comments = (f"cellcal run {run_id} ({kind}): {len(G)} {where} from {state_dir}",
                    f"{again} (the settings and covariances result {result_id} was solved with: it repeats that solve)")
    else:
        comments = (f"cellcal run {run_id} ({kind}): {len(G)} {where} from {state_dir}", f"{again} ({extras.note})")
    try:
        text = format_stations(out, G, M, kind, comments=comments, covariances=extras.covariances,
                               capture_time_s=extras.capture_time_s, capture_speed_m_s=extras.capture_speed_m_s,
                               settings=extras.settings)
        write_output(out, text, force=args.force)
    except OutputRefused as exc:
        print(f"cellcal stations: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"cellcal stations: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    said = "with the settings it was solved with" if extras.settings is not None else f"({extras.note})"
    print(f"run {run_id} ({kind}): {len(G)} stations written to {out} {said}")
    return 0


#: The offline ``--setup`` that solves a camera run's folder as the daemon did (kind -> setup).
_SETUP_OF_KIND = {"intrinsics": "intrinsics", "hand_eye": "eye_in_hand", "eye_to_hand": "eye_to_hand"}


def _write_camera(out: Path, run_id: int, state_dir: Path, kind: str, toml: str,
                  rows: list[tuple[str, bytes, npt.NDArray[np.float64] | None]]) -> int:
    """A camera run's stations as a dataset folder (module docstring)."""
    comments = (f"cellcal run {run_id} ({kind}): {len(rows)} camera stations from {state_dir}",
                f"solve again with: cellcal solve {out} --setup {_SETUP_OF_KIND.get(kind, kind)}")
    try:
        write_dataset(out, toml, rows, comments=comments)
    except (DatasetError, StoreError, OSError) as exc:
        print(f"cellcal stations: cannot write {out}: {exc}", file=sys.stderr)
        return 2
    print(f"run {run_id} ({kind}): {len(rows)} camera stations written to {out}/")
    return 0
