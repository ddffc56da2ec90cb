"""The project's own files: a LICENSE that is the licence pyproject declares, word for word, and
a ``make demo`` that installs only what the demo needs (the test extra's tools are not the
demo's: ``tests/test_packaging.py`` runs the demo from the bare wheel)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: SHA-256 of the Apache License 2.0 as the Apache Software Foundation publishes it
#: (LICENSE-2.0.txt, 202 lines, the appendix included).
APACHE_2_0_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_license_file_is_the_declared_licence_in_full():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_0_SHA256, "LICENSE is not the Apache License 2.0 text"
    words = text.decode("ascii")
    assert "Apache License\n                           Version 2.0, January 2004" in words
    assert all(f"{n}. " in words for n in range(1, 10)) and "END OF TERMS AND CONDITIONS" in words


def test_make_demo_installs_the_runtime_dependencies_only(tmp_path):
    if shutil.which("make") is None:
        pytest.fail("make is missing: run `make os-deps` (or install make)")
    # -n: print, do not run; -B: as if nothing were installed; a venv that does not exist.
    # Under `make test` this make is a sub-make: without MAKELEVEL/MAKEFLAGS from the outer one it
    # prints no "make[1]: Entering directory" lines around what it would run.
    env = {k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    r = subprocess.run(["make", "--no-print-directory", "-n", "-B", "demo", f"VENV={tmp_path / 'venv'}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, env=env)
    assert r.returncode == 0, r.stderr
    installs = [ln for ln in r.stdout.splitlines() if " install " in ln and " -e " in ln]
    assert installs and all(ln.rstrip().endswith("-e .") for ln in installs), r.stdout
    assert "[test]" not in r.stdout and "cellcal demo" in r.stdout.splitlines()[-1]
