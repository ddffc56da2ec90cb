"""``cellcal.testing``: a simulated cell and a daemon for simulation-backed CI.

Installed as ``cellcal.testing`` (pyproject's ``package-dir``; its folder sits in
``daemon/`` because it starts a daemon), with a pytest plugin (entry point ``pytest11``,
:mod:`cellcal.testing.plugin`) whose fixtures start a simulated cell and a daemon on
loopback for an integrator's own tests (``docs/testing.md``). :mod:`harness` holds the
pieces: the in-process cell (:func:`~cellcal.testing.harness.inprocess_cell`), the
simulator and daemon as processes (:class:`~cellcal.testing.harness.SimProcess`,
:class:`~cellcal.testing.harness.DaemonProcess`), a recorder of everything published
(:class:`~cellcal.testing.harness.Recorder`) and the kill -9 soak.
"""

# One package under one name. Its folder sits inside daemon/, so wherever daemon/ is
# importable as cellcal.daemon (an editable install, a checkout on the path) the import system
# would also find this folder as cellcal.daemon.testing and load every module a second time:
# a second HarnessError, a second DaemonProcess, never equal to cellcal.testing's. The wheel
# has no cellcal/daemon/testing at all; here that name is refused the same way, by name.
if __name__ != "cellcal.testing":
    raise ImportError(f"{__name__} is no package: the test harness is cellcal.testing (import cellcal.testing)",
                      name=__name__)
