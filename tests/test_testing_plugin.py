"""cellcal.testing's pytest plugin as an integrator's test suite uses it.

The documented example (``docs/examples/test_my_client.py``) runs in a pytest of its own
(``pytester``, in a subprocess: the plugin is loaded by its entry point, as anywhere cellcal
is installed) with the cell in this process and with a point instrument on CiA 402 drives;
the marker's arguments are checked. The example's process mode runs against the installed
wheel in ``tests/test_packaging.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cellcal.testing.plugin import CellSettings

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = (ROOT / "docs" / "examples" / "test_my_client.py").read_text()


def test_the_marker_refuses_what_it_does_not_know(tmp_path):
    with pytest.raises(ValueError, match="mode must be one of"):
        CellSettings(mode="threads")
    with pytest.raises(ValueError, match="robot must be"):
        CellSettings(robot="kuka")
    with pytest.raises(ValueError, match="instrument must be"):
        CellSettings(instrument="faro")
    with pytest.raises(ValueError, match="neither exact, realistic nor a file"):
        CellSettings(scenario=str(tmp_path / "missing.toml"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_documented_example_passes_in_process(pytester):
    pytester.makepyfile(test_my_client=EXAMPLE.replace('mode="process"', 'mode="inprocess"'))
    r = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_point_instrument_on_cia402_drives_and_a_wrong_expectation_fails(pytester):
    # The fixtures serve what the marker asks for, and a client's wrong assertion fails the test
    # (the fixtures do not hide a failure).
    pytester.makepyfile(test_points='''
import pytest

@pytest.mark.cellcal(instrument="emscon", robot="canopen", mode="inprocess", n_stations=6)
def test_points(sim_cell, daemon, cellcal_client):
    assert sim_cell.urls["robot"].startswith("canopen://")
    assert sim_cell.urls["tracker"].startswith("emscon://")
    run_id = cellcal_client.call("start_run", kind="base_frame")["run_id"]
    body = daemon.wait_result(run_id, timeout_s=300)
    assert "flange_p_target" in body["points"]       # a reflector: the point model

@pytest.mark.cellcal(mode="inprocess")
def test_wrong(daemon, cellcal_client):
    assert cellcal_client.call("get_status")["state"] == "CAPTURING"
''')
    r = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    r.assert_outcomes(passed=1, failed=1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sim_cell_takes_its_cell_from_an_indirect_parameter_over_the_marker(pytester):
    # The parameter wins over the marker, key by key; robot_transport is the CLI's name for robot.
    pytester.makepyfile(test_param='''
import pytest

@pytest.mark.cellcal(instrument="emscon", mode="inprocess")
@pytest.mark.parametrize("sim_cell, want", [({"instrument": "geocom", "robot_transport": "rtde"}, "geocom"),
                                             ({}, "emscon")], indirect=["sim_cell"])
def test_cell(sim_cell, want):
    s = sim_cell.settings
    assert (s.mode, s.robot, s.instrument) == ("inprocess", "rtde", want)
    assert sim_cell.urls["tracker"]

@pytest.mark.parametrize("sim_cell", [42], indirect=True)
def test_bad(sim_cell):
    pass
''')
    r = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-rA")
    r.assert_outcomes(passed=2, errors=1)
    out = r.stdout.str()
    assert "must be a mapping or a CellSettings" in out
