"""Wall time of the two test tiers: ``make check``'s fast tier and ``make test``'s whole suite.

Issue 23 asks for ``make check`` (lint and the tests not marked ``slow``) under 2 minutes and
``make test`` (everything) under 6 on 2 cores, figures recorded with the load average. This
runs the tiers' own commands (the Makefile's ``PYTEST``: ``-n WORKERS --dist loadfile``) from
this tree's ``.venv``, each in a child process, and reports for each run: wall time, the CPU
its processes used (``RUSAGE_CHILDREN``, as a share of the wall time: how much of the run
waits on simulated devices), the tests passed and failed, the load average at its start, and
the files whose tests took longest (summed ``--durations=0`` phases: the ones that bound the
wall time, since ``--dist loadfile`` keeps a file on one worker).

Run: ``.venv/bin/python bench/suite_bench.py [--workers 3] [--skip-lint]``. Several
``--workers`` values run the full suite once each, in the order given (interleave them by
repeating, e.g. ``--workers 3 4 4 3``). Writes the ``suite`` section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._results import machine_line, write_section  # noqa: E402

PY = str(ROOT / ".venv" / "bin" / "python")


def _make_workers() -> int:
    """The workers the Makefile's ``PYTEST`` runs (``-n N``): the figure is the targets' own."""
    m = re.search(r"^PYTEST :=.*?-n (\d+)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    if m is None:
        raise SystemExit("Makefile: no 'PYTEST := ... -n N' line")
    return int(m.group(1))
_DURATION = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+(tests/[^:\s]+)")
_SUMMARY = re.compile(r"(\d+) (passed|failed|errors?|skipped)")


@dataclass
class Run:
    what: str
    wall_s: float
    cpu_s: float
    load: float
    counts: dict[str, int]
    files: list[tuple[str, float]]
    rc: int


def _timed(what: str, cmd: list[str]) -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    per_file: collections.Counter[str] = collections.Counter()
    counts: dict[str, int] = {}
    for line in r.stdout.splitlines():
        m = _DURATION.match(line)
        if m:
            per_file[m.group(2)] += float(m.group(1))
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    for n, k in _SUMMARY.findall(tail):
        counts[k.rstrip("s") if k.startswith("error") else k] = int(n)
    if r.returncode != 0:
        print(r.stdout[-3000:], r.stderr[-2000:], sep="\n", file=sys.stderr)
    return Run(what, wall, cpu, load, counts, per_file.most_common(8), r.returncode)


def _pytest(workers: int, *marker: str) -> list[str]:
    return [PY, "-m", "pytest", "-q", "-n", str(workers), "--dist", "loadfile", "-p", "no:cacheprovider",
            "--durations=0", *marker, "tests"]


def _row(r: Run) -> str:
    counts = ", ".join(f"{v} {k}" for k, v in sorted(r.counts.items()))
    return (f"| {r.what} | {r.wall_s:.0f} s ({r.wall_s / 60:.1f} min) | {r.cpu_s / r.wall_s * 100:.0f} % "
            f"| {r.load:.2f} | {counts or '-'} | {r.rc} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    workers = _make_workers()
    ap.add_argument("--workers", type=int, nargs="+", default=[workers],
                    help="pytest-xdist workers for the full suite (default: the Makefile's)")
    ap.add_argument("--skip-lint", action="store_true", help="leave ruff and mypy out of make check's figure")
    args = ap.parse_args()
    if any(w < 1 for w in args.workers):
        ap.error("--workers must be >= 1")

    runs: list[Run] = []
    lint_s = None
    if not args.skip_lint:
        t0 = time.monotonic()
        subprocess.run(["make", "lint"], cwd=ROOT, capture_output=True, stdin=subprocess.DEVNULL, check=True)
        lint_s = time.monotonic() - t0
    # As both make targets do before pytest: the package's bytecode and the tests' rewritten
    # modules (the Makefile says why), from none cached, as on a clean clone.
    shutil.rmtree(ROOT / "tests" / "__pycache__", ignore_errors=True)
    t0 = time.monotonic()
    subprocess.run(["make", "bytecode"], cwd=ROOT, capture_output=True, stdin=subprocess.DEVNULL, check=True)
    bytecode_s = time.monotonic() - t0
    fast = _timed(f"make check: the fast tier (-m 'not slow', {workers} workers)", _pytest(workers, "-m", "not slow"))
    runs.append(fast)
    for w in args.workers:
        runs.append(_timed(f"make test: the whole suite ({w} workers)", _pytest(w)))

    lines = [
        "## Test suite wall time (`bench/suite_bench.py`)",
        "",
        machine_line(),
        "",
        "**How to read.** Each row is one run of a tier's pytest command from this tree (`--dist loadfile`, "
        "`--durations=0`), timed from outside; *CPU* is the user + system time of the run's processes as a "
        "share of its wall time (200 % is both cores busy: below it the run waits on simulated devices); "
        "*load* is the 1-minute load average when the row started. Targets (issue 23): `make check` under "
        "2 minutes, `make test` under 6, on 2 cores.",
        "",
        "| run | wall | CPU | load | tests | exit |",
        "|---|---:|---:|---:|---|---:|",
        *[_row(r) for r in runs],
        "",
    ]
    lines += [f"`make bytecode` (the package compiled and the tests collected once, none cached before, part "
              f"of both targets): {bytecode_s:.0f} s.", ""]
    if lint_s is not None:
        lines += [f"`make lint` (ruff and mypy, part of both targets): {lint_s:.0f} s. `make check` in all: "
                  f"{lint_s + bytecode_s + fast.wall_s:.0f} s.", ""]
    for r in runs[1:]:
        top = ", ".join(f"`{Path(f).name}` {s:.0f} s" for f, s in r.files)
        lines += [f"Longest files ({r.what}; summed phases, one worker each): {top}.", ""]
    write_section("suite", "\n".join(lines))
    print("\n".join(lines))
    return 0 if all(r.rc == 0 for r in runs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
