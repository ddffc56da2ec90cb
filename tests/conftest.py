"""Shared test settings and helpers.

* hypothesis profiles sized for a 2-core CI machine;
* :func:`wait_until`, the one way a test waits for something to happen. The suite must pass
  while other jobs load the machine (``make test-stress``), so a test never sleeps a fixed
  time and then counts or checks what happened: it waits, with a generous deadline, for the
  condition it needs, and then asserts on properties that hold however slow the machine is.
  Test modules import it with ``from conftest import wait_until``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings

from cellcal.daemon.blas import limit_loaded_blas, prefer_one_blas_thread

# One BLAS thread, as the cellcal command runs (ADR 0033): for the processes the tests start
# (they inherit the variable) and for this one, where numpy is loaded already (the cellcal
# pytest plugin imports it). Two OpenBLAS threads per worker, three workers on two cores, made
# every small product wait for a busy core.
prefer_one_blas_thread()
limit_loaded_blas()

settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile("ci")

# Per-test time limits (pytest-timeout; the default is in pyproject.toml). Soak tests whose run
# time grows with the machine's load get more here, where a decorator on the test would
# otherwise go.
LONGER_TIMEOUT_S = {
    "test_daemon_kill.py::test_kill_9_during_capture_loses_and_duplicates_nothing": 600,
}


#: Files of the slow tier whose source stays as it is (the ZeroMQ contract tests are kept
#: untouched): marked here instead of by their own ``pytestmark``.
SLOW_FILES = {"test_contract.py"}


#: The files of 8 s or more (their tests' wall time summed, five workers on two cores), longest
#: first (``bench/suite_bench.py``'s "Longest files"), handed out first by
#: :class:`_LongestFilesFirst`: the longest-first order keeps the short files for the end, where
#: they fill the workers evenly. With only the 15 longest listed, 18 s and 12 s files came last
#: and one worker ran 30 s alone.
LONGEST_FIRST = (
    "test_daemon_points.py", "test_daemon_iso9283.py", "test_demo_camera.py",
    "test_realistic_cell.py", "test_daemon_kill.py", "test_daemon_kinematics_cia402.py",
    "test_zmq_cli.py", "test_report_cli.py", "test_cli_solve.py", "test_daemon_kinematics.py",
    "test_daemon_faults.py", "test_daemon_zmq.py", "test_daemon_lying_devices.py",
    "test_packaging.py", "test_daemon_stack.py", "test_daemon_camera_dynamic.py",
    "test_plant_opcua.py", "test_hand_eye_camera_nees.py", "test_canopen_factory.py",
    "test_demo_cli.py", "test_daemon_interrupted_runs.py", "test_devices_early.py",
    "test_daemon_hand_eye_eye_to_hand.py", "test_testing_plugin.py", "test_canopen.py",
    "test_zmq_local.py", "test_daemon_intrinsics.py", "test_daemon_intrinsics_process.py",
    "test_honest_uncertainty.py", "test_plan_target.py", "test_plant_mqtt.py",
    "test_daemon_consistency.py", "test_small_n.py", "test_hand_eye_offline.py",
    "test_daemon_hand_eye_camera.py", "test_rtde_sim.py", "test_init_first_run.py",
    "test_identify_consider_trials.py", "test_abort_states.py", "test_plant_metrics.py",
    "test_camera_store.py", "test_store_crash.py", "test_canopen_sim.py", "test_daemon_gates.py",
    "test_gross_error_offsets.py", "test_hand_eye_camera_render.py", "test_contract.py",
    "test_sim_camera.py", "test_canopen_attacks.py", "test_urrtde_control_peer.py",
    "test_daemon_screening_paths.py", "test_zmq_server.py",
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` handing out :data:`LONGEST_FIRST` before the other files.

    pytest-xdist queues the files by their number of tests, most first: a file of one long
    test (the CiA 402 kinematics run, 50 s) came last and ran alone while the other workers
    were done. With the longest first, the many short files fill the workers at the end.
    """
    if config.getoption("dist", None) != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class _LongestFilesFirst(LoadFileScheduling):
        _ordered = False

        def _assign_work_unit(self, node: object) -> None:
            if not self._ordered:
                def rank(scope: str) -> int:
                    name = scope.rsplit("/", 1)[-1]
                    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

                # a stable sort: the other files keep xdist's order (most tests first)
                order = sorted(self.workqueue, key=rank)
                for scope in order:
                    self.workqueue.move_to_end(scope)
                self._ordered = True
            super()._assign_work_unit(node)

    return _LongestFilesFirst(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        test = item.nodeid.rsplit("/", 1)[-1]  # the same from the repository or from tests/
        if test in LONGER_TIMEOUT_S:
            item.add_marker(pytest.mark.timeout(LONGER_TIMEOUT_S[test]))
        if test.split("::", 1)[0] in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


T = TypeVar("T")

#: How long :func:`wait_until` sleeps between two looks at the predicate.
POLL_S = 0.005


def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, *, poll_s: float = POLL_S) -> T:
    """Call ``predicate`` until it returns something truthy; return that value.

    Raises ``AssertionError`` naming ``what`` was awaited if ``timeout_s`` (monotonic clock)
    passes first. The predicate is always called at least once more after the deadline has
    passed, so a condition that became true while the machine was busy elsewhere still counts.
    Exceptions from the predicate propagate (a test that expects them says so).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        expired = time.monotonic() >= deadline
        value = predicate()
        if value:
            return value
        if expired:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(poll_s)
