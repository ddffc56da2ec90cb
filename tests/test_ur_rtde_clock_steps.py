"""The UR driver's controller clock: a package out of order is not a restart.

A controller stamps each data package with its own clock (seconds since power-on). A stamp
older than the last by a little is a package out of order (it is mapped, not fed to the
clock model, and nothing is logged above debug); one older by more than half a second is the
controller starting again, which resets the clock model with a warning naming the step.
"""

from __future__ import annotations

import logging

from cellcal.drivers.ur_rtde import UrRtdeDriver

RATE_HZ = 500.0


def _feed(drv: UrRtdeDriver, t_dev: float, t0_ns: int) -> None:
    # The host receives each package 2 ms after its stamp (a steady link).
    drv._sample({"timestamp": t_dev}, t0_ns + int((t_dev + 0.002) * 1e9))


def _warmed_up() -> UrRtdeDriver:
    drv = UrRtdeDriver("127.0.0.1", 1)  # no I/O until open()
    for k in range(int(2 * RATE_HZ)):
        _feed(drv, 100.0 + k / RATE_HZ, 0)
    assert drv.clock.ready
    return drv


def test_a_package_out_of_order_is_mapped_without_a_reset_or_a_warning(caplog):
    drv = _warmed_up()
    last = 100.0 + (2 * RATE_HZ - 1) / RATE_HZ
    with caplog.at_level(logging.DEBUG, logger="cellcal.drivers.ur_rtde"):
        raw = drv._sample({"timestamp": last - 0.004}, int((last - 0.004 + 0.002) * 1e9))
        _feed(drv, last + 1 / RATE_HZ, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text
    assert "before the last one" in caplog.text
    assert drv.clock.ready  # the model was not reset
    # the stale package is still mapped onto the host clock, near its true host time
    assert abs(raw.t_host_ns - int((last - 0.004 + 0.002) * 1e9)) < 1_000_000


def test_a_controller_restart_resets_the_clock_model_with_a_warning(caplog):
    drv = _warmed_up()
    with caplog.at_level(logging.WARNING, logger="cellcal.drivers.ur_rtde"):
        _feed(drv, 0.5, 0)  # the controller counts from power-on again
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and "controller clock went back" in warned[0] and "restarted" in warned[0], warned
    assert not drv.clock.ready  # one sample since the reset: no model yet
