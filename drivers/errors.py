"""Driver errors: the ``DriverError`` branch of the one exception tree.

The whole tree, with every subclass the device modules add, is documented in one place:
:mod:`cellcal.solver.errors`. The classes here are the ones a caller catches by kind:
``DriverInitError`` (could not open or identify), ``DriverTimeoutError`` (also a builtin
``TimeoutError``), ``ProtocolError`` (bytes that do not parse: the codecs raise it per bad
frame and carry on decoding), ``DeviceGoneError`` (the link dropped) and ``DeviceError``
(the device answered with an error; ``code`` is the device's code, by name).
"""

from __future__ import annotations

from cellcal.solver.errors import CellcalError

__all__ = [
    "DriverError",
    "DriverInitError",
    "DriverTimeoutError",
    "ProtocolError",
    "DeviceGoneError",
    "DeviceError",
]


class DriverError(CellcalError):
    """Something went wrong talking to a device."""


class DriverInitError(DriverError):
    """The device could not be opened, identified or configured."""


class DriverTimeoutError(DriverError, TimeoutError):
    """The device did not answer within the timeout."""


class ProtocolError(DriverError):
    """Bytes on the wire that do not form a valid message."""


class DeviceGoneError(DriverError):
    """The connection to the device was lost."""


class DeviceError(DriverError):
    """The device reported an error condition.

    Attributes
    ----------
    code : str
        The device's error code, by name.
    """

    def __init__(self, message: str, code: str = "") -> None:
        super().__init__(message)
        self.code = code
