"""kill -9 soak of the daemon: SIGKILL ``cellcal run`` at random moments while it captures.

Run as ``.venv/bin/python bench/kill_soak.py [--kills 200] [--seed 0]``; prints a summary
and writes the ``kill_soak`` section of ``bench/RESULTS.md``.

What it does (the promise: "no accepted station is ever lost, kill -9 at any moment"):

1. ``cellcal sim`` on the fast scenario (``cellcal.testing.harness.FAST_SCENARIO``, time
   x10) in its own process, alive for the whole soak: the robot and the tracker (pty) do
   not notice that the daemon in front of them dies and comes back.
2. A **reference**: one uninterrupted base-frame run with its own state directory.
3. The **soak**: ``cellcal run`` on a second state directory; a run is started over
   ZeroMQ; every daemon instance is killed with SIGKILL after a random number (0-2) of
   accepted stations plus a random delay (so the kill lands anywhere in a station: moving,
   settling, measuring, committing), then started again on the same state directory,
   where it resumes the unfinished run. When a run completes, the next one is started.
   A raw SUB socket records every ``cellcal/v1/station`` message each instance published.
4. The **audit**: ``PRAGMA integrity_check`` is ok, no ``(run_id, plan_index)`` twice,
   every station any instance published as accepted is in the store (a station is
   published only after its transaction committed), every run finished, each with exactly
   one result, and each result agrees with the reference within the noise (each of the
   six components of ``log(X_ref^-1 X)`` within ``K_SIGMA`` times the square root of the
   sum of the two results' own covariances, which the solver estimates from the
   residuals, i.e. from the tracker noise the stations really had).

The soak itself is :func:`cellcal.testing.soak.soak` (``tests/test_daemon_kill.py`` runs
it with 20+ kills); this script is its command line and its ``RESULTS.md`` section.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script: make `bench._results` importable
    sys.path.insert(0, str(ROOT))

from cellcal.testing.harness import K_SIGMA, SoakError  # noqa: E402
from cellcal.testing.soak import soak  # noqa: E402


@contextmanager
def _workdir(keep: str | None) -> Iterator[Path]:
    if keep:
        p = Path(keep)
        p.mkdir(parents=True, exist_ok=True)
        yield p
    else:
        with tempfile.TemporaryDirectory(prefix="cellcal-kill-soak-") as d:
            yield Path(d)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=200, help="SIGKILLs of the daemon (default 200)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the kill moments")
    ap.add_argument("--stations", type=int, default=8, help="stations per run")
    ap.add_argument("--workdir", default=None, help="keep state, logs and configs here (default: a temporary directory)")
    ap.add_argument("--no-write", action="store_true", help="do not write bench/RESULTS.md")
    args = ap.parse_args(argv)
    # Imported before the soak: the module notes the load average the soak starts under.
    from bench._results import machine_line, write_section

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with _workdir(args.workdir) as wd:
        try:
            rep = soak(args.kills, workdir=wd, seed=args.seed, n_stations=args.stations, log=say)
        except SoakError as exc:
            print(f"kill soak FAILED: {exc}", file=sys.stderr)
            return 1
    print(rep.summary())

    dist = ", ".join(f"{k}: {v}" for k, v in sorted(rep.kills_by_accepted_before.items()))
    killed = [i.state_at_kill for i in rep.instances if i.killed_s is not None]
    states = ", ".join(f"{st}: {killed.count(st)}" for st in sorted(set(killed), key=str))
    md = "\n".join([
        "## kill -9 soak (`bench/kill_soak.py`)",
        "",
        machine_line(),
        "",
        f"`cellcal run` killed with SIGKILL {rep.kills} times at random moments of its capture "
        f"(after 0-2 accepted stations plus 0-0.6 s), restarted on the same state directory each "
        f"time; simulated cell at x10 (`cellcal.testing.harness.FAST_SCENARIO`), {args.stations} stations per run, "
        f"seed {args.seed}.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| kills | {rep.kills} |",
        f"| daemon starts | {len(rep.instances)} |",
        f"| wall time | {rep.wall_s:.1f} s |",
        f"| runs finished (each with exactly one result) | {len(rep.runs_done)} |",
        f"| runs interrupted by a kill and resumed | {rep.runs_resumed} |",
        f"| stations committed | {len(rep.audit['stations'])} |",
        f"| stations seen published as accepted | {len(rep.published_accepted)} (all in the store) |",
        "| stations lost / duplicated | 0 / 0 |",
        f"| `PRAGMA integrity_check` | {rep.audit['integrity'][0]} |",
        f"| kills by stations the instance had accepted | {dist} |",
        f"| daemon state at the kill | {states} |",
        f"| worst result deviation from an uninterrupted run | {rep.worst_translation_m * 1e6:.2f} um, "
        f"{math.degrees(rep.worst_rotation_rad) * 1e3:.3f} mdeg ({rep.worst_sigma:.2f} sigma; limit {K_SIGMA:g}) |",
    ])
    if not args.no_write:
        write_section("kill_soak", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
