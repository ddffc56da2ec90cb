"""`cellcal demo --json` (what `make demo` runs, machine-readable): exactly one JSON object."""

import json
import re
import subprocess
import sys

import numpy as np


def test_demo_json_is_the_published_result_with_truth_error():
    r = subprocess.run(
        [sys.executable, "-m", "cellcal.daemon.cli", "demo", "--stations", "6", "--json"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1  # exactly one JSON object on stdout; progress went to stderr
    out = json.loads(lines[0])
    assert re.search(r"station +6/6: accepted", r.stderr)
    for name, parent, child in (("cell_T_base", "cell", "base"), ("flange_T_target", "flange", "target")):
        t = out["transforms"][name]
        assert (t["parent_frame"], t["child_frame"]) == (parent, child)
        M = np.array(t["matrix"]).reshape(4, 4)
        assert np.allclose(M[:3, 3], t["translation_m"]) and np.allclose(M[3], [0, 0, 0, 1])
        q = t["quaternion"]
        assert set(q) == {"w", "x", "y", "z"} and q["w"] >= 0
    assert out["n_stations"] == 6 and len(out["residuals"]["translation_m"]) == 6
    assert 0 < out["axis_spread"] <= 1 and out["active"] and out["gates"]["passed"]
    assert out["provenance"]["config_sha256"] and out["provenance"]["cellcal_version"]
    assert out["truth_error"]["translation_m"] < 0.05e-3  # the sim's noise is micrometres
    assert out["drift_check"]["status"] == "ok"
