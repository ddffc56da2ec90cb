"""One exception tree: every public exception derives from ``CellcalError`` and is named in
the one docstring that documents the tree (``cellcal.solver.errors``)."""

import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import cellcal.solver.errors as errors_module
from cellcal.solver.errors import CellcalError

TREE_DOC = errors_module.__doc__ or ""


def _exceptions(package: str) -> list[type[BaseException]]:
    pkg = importlib.import_module(package)
    found = []
    for info in pkgutil.walk_packages(pkg.__path__, prefix=f"{package}."):
        if info.name == "cellcal.daemon.testing":  # its folder, refused under that name: it is cellcal.testing
            continue
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if (inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__
                    and not name.startswith("_")):
                found.append(obj)
    return found


@pytest.mark.parametrize("package", ["cellcal.solver", "cellcal.drivers", "cellcal.sim", "cellcal.daemon",
                                     "cellcal.testing"])
def test_every_exception_is_in_the_tree_and_documented(package):
    found = _exceptions(package)
    assert found, package
    for cls in found:
        assert issubclass(cls, CellcalError), f"{cls.__module__}.{cls.__name__} escapes the CellcalError tree"
        assert cls.__name__ in TREE_DOC, f"{cls.__name__} is missing from the tree in cellcal.solver.errors"


def test_second_bases_keep_callers_working():
    from cellcal.drivers.clock import ClockNotReady, ExchangeClockModel
    from cellcal.drivers.errors import DriverError, DriverTimeoutError
    from cellcal.drivers.kinematics import UnreachablePose, dh_model
    from cellcal.sim.errors import ScenarioError, SimError, SimRefused

    assert issubclass(ClockNotReady, DriverError) and issubclass(ClockNotReady, RuntimeError)
    with pytest.raises(RuntimeError, match="no clock sample"):
        ExchangeClockModel().to_host_ns(0.0)
    assert issubclass(DriverTimeoutError, TimeoutError)
    far = np.eye(4)
    far[0, 3] = 10.0
    with pytest.raises(ValueError, match="beyond") as ei:
        dh_model("ur5e").inverse(far, [0.0] * 6)
    assert isinstance(ei.value, UnreachablePose) and isinstance(ei.value, CellcalError)
    assert issubclass(ScenarioError, ValueError) and issubclass(ScenarioError, SimError)
    assert issubclass(SimRefused, SimError) and not issubclass(SimRefused, ValueError)


def test_names_stay_importable_where_they_were():
    from cellcal.drivers.canopen402 import HeartbeatLost, NodeRebooted, SdoAbortError  # noqa: F401
    from cellcal.drivers.clock import ClockNotReady  # noqa: F401
    from cellcal.drivers.kinematics import UnreachablePose  # noqa: F401
    from cellcal.sim.errors import ScenarioError as S2
    from cellcal.sim.errors import SimRefused as R2
    from cellcal.sim.robot_sim import SimRefused
    from cellcal.sim.scenario import ScenarioError

    assert SimRefused is R2 and ScenarioError is S2


def test_sdo_abort_text_is_canopens_table():
    from canopen.sdo.exceptions import SdoAbortedError

    from cellcal.drivers import canopen402

    assert canopen402.SDO_ABORT_CODES is SdoAbortedError.CODES
    e = canopen402.SdoAbortError(3, 0x6064, 0, 0x06090011, "read")
    assert e.abort_code == 0x06090011 and e.code == "0x06090011"
    assert SdoAbortedError.CODES[0x06090011] in str(e) and "node 3" in str(e) and "0x6064:00" in str(e)
    assert canopen402.sdo_abort_text(0x0BADC0DE) == "unknown abort code"
    assert isinstance(e, CellcalError)
