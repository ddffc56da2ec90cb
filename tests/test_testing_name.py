"""``cellcal.testing`` is the test harness's one name: its folder (daemon/testing) sits inside
cellcal.daemon's, and importing it as ``cellcal.daemon.testing`` would load a second copy of
every module (a class imported through both names would be two classes). That name raises
ImportError naming ``cellcal.testing``, in a fresh interpreter (nothing imported before)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, sys
out = {}
for stmt in ("import cellcal.daemon.testing", "import cellcal.daemon.testing.harness",
             "from cellcal.daemon import testing", "from cellcal.daemon.testing.plugin import CellSettings"):
    try:
        exec(stmt, {})
        out[stmt] = None
    except ImportError as exc:
        out[stmt] = [type(exc).__name__, str(exc)]
import cellcal.daemon.harness as old
import cellcal.testing.harness as harness
out["same_class"] = old.DaemonProcess is harness.DaemonProcess and old.HarnessError is harness.HarnessError
out["modules"] = sorted(m for m in sys.modules if m.startswith("cellcal.daemon.testing"))
print(json.dumps(out))
"""


@pytest.mark.parametrize("first", ["nothing", "cellcal.testing"])
def test_cellcal_daemon_testing_is_refused_by_name(tmp_path, first):
    code = PROBE if first == "nothing" else f"import {first}\n" + PROBE
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.splitlines()[-1])
    for stmt in ("import cellcal.daemon.testing", "import cellcal.daemon.testing.harness",
                 "from cellcal.daemon import testing", "from cellcal.daemon.testing.plugin import CellSettings"):
        assert out[stmt] is not None, f"{stmt}: imported"
        kind, message = out[stmt]
        assert "cellcal.testing" in message.replace("cellcal.daemon.testing", ""), (stmt, message)
    assert out["same_class"]
    assert out["modules"] == [], out["modules"]
