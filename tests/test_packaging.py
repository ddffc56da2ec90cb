"""The wheel as a user installs it: the example configs and the demo scenario ship inside,
and `cellcal demo`, `cellcal init` and `cellcal check-config` work from any directory.

The wheel is built from a copy of the source tree (so the checkout gets no build/ or
egg-info) without network access (``--no-build-isolation``: the build backend, setuptools
>= 77, is in the test extra), installed
with ``--no-deps --no-index`` into a fresh venv that sees the test venv's site-packages for
numpy, pyzmq ... (a plain path entry: the checkout's editable-install hook there is a .pth
file, which a plain path entry does not run), and run from an empty directory outside the
checkout.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ("cellcal.toml", "cellcal-can.toml", "demo.toml", "demo-scenario.toml")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "CELLCAL_CONFIG")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv bin directory, wheel path, an empty working directory outside the checkout)."""
    base = tmp_path_factory.mktemp("wheel")
    src = base / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".hypothesis", "_work",
        ".cellcal-demo"))
    out = base / "dist"
    # No build isolation: the build backend pyproject.toml asks for (setuptools >= 77) is the
    # test venv's own (the test extra), so the build needs no package index.
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                        "-w", str(out), str(src)],
                       capture_output=True, text=True, timeout=300, env=_env(), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"building the wheel failed:\n{r.stdout}\n{r.stderr}"
    (wheel,) = out.glob("cellcal-*.whl")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    (site_dir,) = (venv / "lib").glob("python3*/site-packages")
    (site_dir / "test-venv-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    r = subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                        "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True, timeout=300, env=_env())
    if r.returncode != 0 and "--python" in r.stderr:  # pip older than 22.3: the venv's own pip
        subprocess.run([str(venv / "bin" / "python"), "-m", "ensurepip", "-q"], check=True, timeout=300)
        r = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                            str(wheel)], capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, f"installing the wheel failed:\n{r.stdout}\n{r.stderr}"
    work = base / "elsewhere"
    work.mkdir()
    return venv / "bin", wheel, work


def _run(installed, *argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    bindir, _, work = installed
    return subprocess.run([str(bindir / "cellcal"), *argv], cwd=work, capture_output=True, text=True, timeout=timeout,
                          env=_env(), stdin=subprocess.DEVNULL)


def test_the_wheel_carries_the_examples_from_config(installed):
    _, wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for name in EXAMPLES:
            assert f"cellcal/examples/{name}" in names, sorted(n for n in names if "examples" in n)
            # The one copy: the packaged file is config/'s, byte for byte.
            assert z.read(f"cellcal/examples/{name}") == (ROOT / "config" / name).read_bytes()
        assert "cellcal/testing/fast_scenario.toml" in names and "cellcal/daemon/report/exports.py" in names
        # The harness under one name only (tests/test_testing_name.py): no second copy as cellcal.daemon.testing.
        assert not [n for n in names if n.startswith("cellcal/daemon/testing/")]


def test_the_wheel_carries_the_licence(installed):
    _, wheel, _ = installed
    with zipfile.ZipFile(wheel) as z:
        (lic,) = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
        assert z.read(lic) == (ROOT / "LICENSE").read_bytes()
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        assert "License-Expression: Apache-2.0" in z.read(meta).decode()


def test_the_installed_package_is_the_wheel_not_the_checkout(installed):
    bindir, _, work = installed
    r = subprocess.run([str(bindir / "python"), "-c",
                        "import cellcal.daemon, cellcal.daemon.cli.examples as e; print(cellcal.daemon.__file__); "
                        "print(e.example_path('demo.toml'))"],
                       cwd=work, capture_output=True, text=True, timeout=60, env=_env())
    assert r.returncode == 0, r.stderr
    for line in r.stdout.split():
        assert Path(line).is_relative_to(bindir.parent) and not Path(line).is_relative_to(ROOT), line


def test_demo_runs_from_the_wheel_in_any_directory(installed):
    r = _run(installed, "demo", "--help")
    assert r.returncode == 0 and "--scenario" in r.stdout, r.stderr
    r = _run(installed, "demo", "--stations", "6", "--no-drift-check", timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "gates passed" in r.stdout + r.stderr


def test_demo_with_a_missing_scenario_is_a_clear_error(installed):
    r = _run(installed, "demo", "--scenario", "missing.toml")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and "missing.toml" in r.stderr and "cannot read" in r.stderr, r.stderr
    r = _run(installed, "demo", "--config", "nope.toml")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "nope.toml" in r.stderr, r.stderr


@pytest.mark.parametrize("robot", ["ur", "cia402", "sim"])
def test_init_from_the_wheel_writes_a_config_check_config_accepts(installed, robot):
    _, _, work = installed
    out = work / f"{robot}.toml"
    out.unlink(missing_ok=True)
    r = _run(installed, "init", "--robot", robot, "-o", str(out))
    assert r.returncode == 0 and out.is_file(), r.stderr
    r = _run(installed, "check-config", "--quiet", str(out))
    assert r.returncode == 0, r.stderr


def test_an_integrators_test_runs_from_its_own_folder_against_the_wheel(installed):
    """docs/testing.md's example, copied into a folder of its own, run by pytest with the wheel
    installed: the plugin's fixtures (entry point pytest11) start a simulated cell and a
    daemon as processes, and the client's calibration maps a cell point into the base."""
    bindir, _, work = installed
    mine = work / "integrator"
    mine.mkdir()
    shutil.copy(ROOT / "docs" / "examples" / "test_my_client.py", mine / "test_my_client.py")
    r = subprocess.run([str(bindir / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "test_my_client.py"], cwd=mine, capture_output=True, text=True, timeout=500, env=_env(),
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert "1 passed" in r.stdout, r.stdout
