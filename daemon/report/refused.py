"""The export files of a result that failed its acceptance gates: where they go and what their
first line says (``cellcal.daemon.report.exports`` writes them; its docstring says why).

A refused result's files are kept (an integrator may want to see what the run produced) but
never where a loadable export is looked for, and never in a form a tool runs or loads as if
it were a calibration: the directory's name, every file's first line and the JSON's first key
say ``GATES FAILED: not for use``; the ROS 2 shell script exits 1 and the launch file raises
before they publish a transform; the UR script pops up the warning and halts before it
defines a pose.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping

from cellcal.daemon.gates import gates_failed

__all__ = ["REFUSED_DIR", "REFUSED_MARK", "refused_text", "mark_refused"]


#: The subdirectory of the export directory that holds a refused result's files.
REFUSED_DIR = "GATES_FAILED_not_for_use"

#: What the first line of every file of a refused result says.
REFUSED_MARK = "GATES FAILED: not for use"


def refused_text(result_dict: Mapping[str, object]) -> str:
    """``GATES FAILED: not for use (rms_translation: ...; ...)`` on one line."""
    failed = "; ".join(gates_failed(result_dict)) or "see the result's gates"
    return re.sub(r"[\x00-\x1f\x7f]+", " ", f"{REFUSED_MARK} ({failed})")


def mark_refused(key: str, text: str, result_dict: Mapping[str, object]) -> str:
    """``text`` of export ``key`` with :data:`REFUSED_MARK` as its first line, and the files that
    run (the ROS 2 script and launch file, the UR script) stopped before they do anything."""
    why = refused_text(result_dict)
    if key in ("urdf", "xacro"):
        # No XML declaration (it must come first if present): the comment is the first line.
        body = text.removeprefix('<?xml version="1.0"?>\n')
        return f"<!-- {re.sub(r'-(?=-)', '- ', why)} -->\n{body}"
    if key == "ros2":
        return f"# {why}\necho {shlex.quote(why)} >&2\nexit 1\n{text}"
    if key == "launch":
        return f"# {why}\nraise SystemExit({why!r})\n{text}"
    if key == "ur":
        return f"# {why}\npopup({json.dumps(REFUSED_MARK)}, title=\"cellcal\", error=True)\nhalt\n{text}"
    return text
