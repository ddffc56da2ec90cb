"""Shared writer for bench/RESULTS.md: each benchmark owns one marked section.

A benchmark calls ``write_section("solver", markdown)``; the text between
``<!-- BEGIN solver -->`` and ``<!-- END solver -->`` is replaced (or appended), so
benchmarks run independently without clobbering each other. The file is rewritten
temp + fsync + rename under an exclusive lock.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
import platform
import re
from pathlib import Path

RESULTS = Path(__file__).with_name("RESULTS.md")
#: The load average when the benchmark started (this module is imported at its start).
_LOAD_AT_START = os.getloadavg()
_HEADER = "# Benchmark results\n\nEach section is written by the benchmark named in it; re-run it to refresh.\n"


def _load(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{v:.2f}" for v in values)


def machine_line() -> str:
    """One line naming the machine, the Python, the date and the load average (1 / 5 / 15 min)
    at the benchmark's start and now, for every section: the machine is shared, and a figure
    means little without the load it was measured under."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    date = _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"Machine: {cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}; run {date}. Load average (1 / 5 / 15 min) "
        f"{_load(_LOAD_AT_START)} at the start, {_load(os.getloadavg())} at the end."
    )


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section ``name`` of bench/RESULTS.md with ``body``."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{body.rstrip()}\n{end}\n"
    lock_path = RESULTS.with_suffix(".lock")
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = RESULTS.read_text() if RESULTS.exists() else _HEADER
        pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
        text = pattern.sub(lambda _m: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block
        tmp = RESULTS.with_suffix(".tmp")
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, RESULTS)
